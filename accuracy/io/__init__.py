"""What every measuring command stands on: result files (reading, checking, the resumable writer, row schemas),
sharding under ``torchrun``, provenance, the run harness (time budget, refusals), the command-line error, the
``--dry-run`` cost model, and the device, memory and progress helpers. Imports nothing else of ``accuracy``."""
