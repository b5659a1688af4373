from batcher.main import main

main()
