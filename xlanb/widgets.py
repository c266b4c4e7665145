"""``from xlanb.widgets import GraphView``: the notebook widgets (extensions/widgets/).

A front end, not part of the core: ``import xlanb`` never loads it, or ipywidgets."""
from .extensions.widgets import *  # noqa: F401,F403
from .extensions.widgets import __all__  # noqa: F401
