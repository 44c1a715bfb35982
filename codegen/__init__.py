"""Stage 2: lower the stream-annotated module to a launch plan, a memory plan and an artifact."""
