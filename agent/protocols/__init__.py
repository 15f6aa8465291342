"""Kernel events to exchanges, one module per protocol (see agent/protocols/table.py)."""
