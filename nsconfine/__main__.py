import sys

from nsconfine._cli.main import main

sys.exit(main(sys.argv[1:]))
