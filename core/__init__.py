"""The ground package: the plumbing every layer uses -- refused input and the CLI wrapper (:mod:`core.errors`),
atomic files (:mod:`core.files`), typed arguments (:mod:`core.arguments`), logging (:mod:`core.logs`). It imports
no other package of the project; ``training``, ``modeling``, ``tokenizer`` and the commands import it."""
