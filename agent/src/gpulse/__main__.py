import sys

from gpulse.cli.main import main

sys.exit(main())
