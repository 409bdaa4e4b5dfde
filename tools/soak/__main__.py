import sys

from tools.soak.driver import main

sys.exit(main())
