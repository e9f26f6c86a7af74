"""Integrations with training libraries; each module imports its library only when imported
(memplan.integrations.transformers: a transformers.TrainerCallback)."""
