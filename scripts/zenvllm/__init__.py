"""zenvllm: run vLLM well on AMD EPYC CPUs.

Layers, each importing only those before it: `core` (pure decisions), `runtime`
(launcher, health, doctor, the host's command line), `image` (matrix, render,
build), `bench`, and the thin `cli` over all of them.
"""

__version__ = "0.1.0"

# What hosts and images receive: the planner and what runs beside it, never the
# image or bench code (the image's COPY and Ansible's plan.yml both ship these).
SHIPPED_LAYERS = ("core", "runtime")
