"""Chips and what they move: the hardware table, the kernel tables, collectives over ICI/DCN/NVLink, the roofline."""
