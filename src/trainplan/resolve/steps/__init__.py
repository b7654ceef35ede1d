"""The resolver's steps, one module each, in the order `trainplan.resolve.pipeline.STEPS` runs them. Each reads what
the steps before it decided on the `Draft` and writes its own part."""
