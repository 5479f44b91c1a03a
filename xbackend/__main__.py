import sys

from xbackend.cli import main

sys.exit(main())
