"""The memory runtime (M1-M57): policy, devices, units, handle (placement), hooks, streamer,
transfer, pinning, graphs, slots, manager, phases, report, calibration, service.

It imports nothing of the application above it (engines, host, command line) and never imports torch
when the package itself is imported: the command line writes the CUDA allocator's environment first.
"""
