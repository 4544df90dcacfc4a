"""The language server of cards (`cardc lsp`): live diagnostics, hover, definitions and
references, completion, document symbols, rename and formatting, for any editor that speaks the
Language Server Protocol.

`document` checks a file as the editor holds it, `index` finds where each name is written,
`positions` maps the parser's columns to the editor's, `features` answers each request, and
`server` wires them to pygls. Only `server` imports pygls.
"""
