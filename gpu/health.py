"""Health check of the gpu queue: which worker answered and what accelerator it sees."""

import importlib.util
from mas.celery_app import app


@app.task(name="gpu.health.ping", bind=True)
def ping(self, tag: str = "") -> dict:
    """Answer with host and device; reads torch's view of CUDA only if torch is installed."""
    device = "cpu (torch not installed)"
    if importlib.util.find_spec("torch") is not None:
        import torch

        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"queue": "gpu", "worker": self.request.hostname, "device": device, "tag": tag}
