"""The command line: thin edges over the compiler, the store and the runtime."""
