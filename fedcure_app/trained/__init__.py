"""The trained model in the user's hands: the files every run leaves in its folder
(``model.pt``, ``model.pt2``, ``task.toml``, ``model.json``; :mod:`.files`), the normalised,
exportable module behind them (:mod:`.exporting`), the model evaluated or asked for predictions
on a user's data (:mod:`.use`, ``fedcure model``) and per-class results by class name
(:mod:`.names`, no torch).
"""
