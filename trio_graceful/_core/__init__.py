"""The core: bundles, inboxes and STOP, cancellation and its reports, tracing.

Nothing here imports from the other layers.
"""
