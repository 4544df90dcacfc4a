"""Renderers: a card's AST written back out (canonical pseudocode text, …)."""
