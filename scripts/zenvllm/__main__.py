from zenvllm.cli import main

raise SystemExit(main())
