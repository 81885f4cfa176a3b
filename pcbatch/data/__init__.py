"""Input data for the TreeRNN models: array-encoded trees, lattices and chains (see `trees`),
and real variable-arity trees, the ASTs of the stdlib's functions (see `ast_trees`)."""
from pcbatch.data.ast_trees import (
    AST_VOCAB,
    AstTrees,
    check_ast_tree,
    load_ast_trees,
    split_of,
    stdlib_modules,
)
from pcbatch.data.trees import (
    AST_TYPES,
    Chain,
    Lattice,
    Tree,
    batch,
    check_chain,
    check_lattice,
    check_tree,
    random_binary_tree,
    random_binary_trees,
    random_chains,
    random_lattice,
    random_lattices,
    stdlib_ast_trees,
    token_id,
    tree_height,
    tree_leaves,
)

__all__ = [
    "AST_VOCAB", "AstTrees", "check_ast_tree", "load_ast_trees", "split_of", "stdlib_modules",
    "AST_TYPES", "Chain", "Lattice", "Tree", "batch", "check_chain", "check_lattice", "check_tree",
    "random_binary_tree", "random_binary_trees", "random_chains", "random_lattice", "random_lattices",
    "stdlib_ast_trees", "token_id", "tree_height", "tree_leaves",
]
