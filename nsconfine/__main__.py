import sys

from nsconfine._cli import main

sys.exit(main(sys.argv[1:]))
