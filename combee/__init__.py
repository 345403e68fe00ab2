"""Combee: scale prompt learning over fleets of agent traces without losing specific insights."""

__version__ = "0.1.0"
