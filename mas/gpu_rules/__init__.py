"""Rules of the GPU side that need no GPU: how measured scores become a grade and failure reasons
(grading.py), and what an in-process LTX-2 recipe needs in VRAM (vram_plan.py). The gpu worker runs them; the
studio's agents, the CLI and the checks before a worker starts read them."""
