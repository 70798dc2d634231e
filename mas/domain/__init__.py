"""The studio's vocabulary, below every other room and with no I/O: the step table and the states it moves a
video through, what a production request is. It imports only the base (config, errors, names, text)."""
