"""Files and their formats: atomic writes, value files, capture folders, the JSON codec,
signed attestations, Markdown text, and reading files from others."""
