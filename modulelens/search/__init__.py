"""optimize: a persistent tree search over candidate kernels for operator cards.

One *search* (kind ``searches``, named by its id) holds one tree per target card. Each tree is a
journal (kind ``search_nodes``, named ``<search id>.t<i>``) whose versions are node records, one
written atomically each time a node is dispatched or completed, so a search killed at any point
continues from what its repository holds. Modules:

* :mod:`.model`: the records (settings, nodes, outcomes);
* :mod:`.tree`: statistics derived from the nodes, UCT selection for minimisation with
  progressive widening, and pruning of stagnant branches (pure logic);
* :mod:`.store`: reading and writing searches and node journals;
* :mod:`.targets`: what a target names (a card, or a capture's top cards) and its roofline bound;
* :mod:`.expansion`: asking a provider for a child of a node;
* :mod:`.executors`: evaluating candidates in local sandbox workers or as Ray tasks;
* :mod:`.loop`: the search itself (budgets, resume, progress, the final re-measurement);
* :mod:`.summary`: the compact view of a tree.
"""
