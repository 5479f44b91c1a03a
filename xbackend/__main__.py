import sys

from xbackend.entry import main

sys.exit(main())
