"""The application: the process runtime and host the nodes share, the command line, chunking,
scripts, the timeline, the checkpoint catalogue, the reference check and ComfyUI's accounting bridge.

Built on the engines and the memory runtime below it; nothing below imports it.
"""
