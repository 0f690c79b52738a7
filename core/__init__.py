"""The ground package: the plumbing every layer of sesame-lm uses, and nothing else -- refused input and the CLI
wrapper (:mod:`core.errors`), atomic files and the output-folder rule (:mod:`core.files`), typed command-line
arguments (:mod:`core.arguments`) and the logging set-up (:mod:`core.logs`). It imports no other package of the
project; ``training``, ``modeling``, ``tokenizer`` and the commands import it."""
