from bench.suite.runner import main

main()
