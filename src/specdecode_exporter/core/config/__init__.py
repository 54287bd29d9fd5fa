"""The config machinery: what a setting's value may be (kinds) and the declared config tree (settings), both without
a validation library so that the tap's process can import them; the one way to validate (validation, pydantic); the
flag values of the subcommands with their own flags (flags)."""
