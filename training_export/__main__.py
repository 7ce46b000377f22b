from training_export.cli import main

raise SystemExit(main())
