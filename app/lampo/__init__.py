"""Lampo: a terminal chat for Qwen3.6 on one NVIDIA GPU."""

__version__ = "0.1.0"
