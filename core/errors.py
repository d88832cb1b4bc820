class UserError(Exception):
    """Bad input from the user: the CLIs print the message on one line and exit non-zero."""
