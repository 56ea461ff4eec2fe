"""``python -m hiergraph``: what this install runs on (:mod:`hiergraph.info`)."""

from hiergraph.info import main

main()
