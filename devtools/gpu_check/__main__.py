"""`python -m devtools.gpu_check` (what `./dev gpu-check` runs): see run.py."""

from devtools.gpu_check.run import main

raise SystemExit(main())
