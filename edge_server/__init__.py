"""FedCure edge server role (see DESIGN.md, Deployment)."""
