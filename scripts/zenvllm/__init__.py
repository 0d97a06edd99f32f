"""zenvllm: run vLLM well on AMD EPYC CPUs."""

__version__ = "0.1.0"
