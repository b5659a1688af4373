from api.main import main

main()
