from brimful.batcher.main import main

main()
