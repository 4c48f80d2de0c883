"""The names the hardware gate's steps and their release values go by (render and gate share them)."""

from __future__ import annotations

HARDWARE_GATE = "hardware"
CHECK_STEP = "hardware-check"  # the first step: what the node has without a driver
VERIFY_STEP = "hardware-verify"  # before the cluster join (or last): everything, with the driver
DIAGNOSTICS_STEP = "gpu-diagnostics"  # dcgmi diag, before the join
HARDWARE_STEPS = frozenset({CHECK_STEP, VERIFY_STEP, DIAGNOSTICS_STEP})
# What the gate's release tells the step: ok | overridden (released by an operator) | run
RESULT_ENV = "TETHER_HARDWARE_RESULT"
SUMMARY_ENV = "TETHER_HARDWARE_SUMMARY"
# The GPU drift conditions (tether.controller.hardware.drift), by type; here so that the metrics
# name them without importing the drift watch (hub, wire, orchestrator)
GPUS_MISSING = "GPUsMissing"
GPU_ERRORS = "GPUErrors"
DRIVER_MISMATCH = "DriverMismatch"
CONDITION_TYPES = (GPUS_MISSING, GPU_ERRORS, DRIVER_MISMATCH)
