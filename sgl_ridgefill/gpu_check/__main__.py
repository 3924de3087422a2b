from sgl_ridgefill.gpu_check.cli import main

raise SystemExit(main())
