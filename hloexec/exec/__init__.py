"""Execution: plans (schedule, liveness, memory), their runners, the ops' context, the executor, inputs,
communicators, SPMD."""
