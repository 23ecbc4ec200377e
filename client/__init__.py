"""FedCure client role (see DESIGN.md, Deployment)."""
