from pipelines.cli import main

raise SystemExit(main())
