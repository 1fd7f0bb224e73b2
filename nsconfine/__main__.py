from nsconfine._cli import console_main

console_main()
