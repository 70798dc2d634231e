"""Health check of the gpu queues: which worker answered, from which queue, and what accelerator it sees."""

import importlib.util
import time

from celery import shared_task

from mas import names


@shared_task(name=names.GPU_PING, bind=True)
def ping(self, tag: str = "") -> dict:
    """Answer with host, queue, device and the time of answering; reads torch's view of CUDA only if installed."""
    device = "cpu (torch not installed)"
    if importlib.util.find_spec("torch") is not None:
        import torch

        configured = self.app.settings.gpu.device
        if configured.startswith("cuda") and torch.cuda.is_available():
            device = f"{configured}: {torch.cuda.get_device_name(torch.device(configured))}"
        elif not configured and torch.cuda.is_available():
            device = f"cuda:0: {torch.cuda.get_device_name(0)}"
        else:
            device = "cpu"
    queue = (self.request.delivery_info or {}).get("routing_key") or names.GPU_QUEUE
    return {"queue": queue, "worker": self.request.hostname, "device": device, "tag": tag, "answered_at": time.time()}
