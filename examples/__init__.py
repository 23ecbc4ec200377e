"""Worked examples of a federation over the clients' own data (docs/own-data.md): data
generators that run offline from scikit-learn's bundled data, and a model given by import path
(``model = "examples.custom_model:factory"``)."""
