from brimful.api.main import main

main()
