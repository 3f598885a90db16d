#!/bin/bash
# Fifteenth session, call 1: the fourteenth session's prepared experiment, run as it was committed (bac0d62): the
# batch-8 first-run peak of the landed code and of the upsamplers through the pick, and the allocations live at it.
exec bash benchmarks/results/H200-2026-11-28/fourteenth-session/prepared-upsampler-memory/run.sh
