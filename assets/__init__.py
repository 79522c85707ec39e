"""Package data: stylesheets (`styles/`), bench prompts, sample documents, small fixtures."""
