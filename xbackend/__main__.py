import sys

from xbackend.cli.entry import main

sys.exit(main())
