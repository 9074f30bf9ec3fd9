"""Figures (matplotlib, Agg) and self-contained HTML reports for runs and studies."""

from .figures import add_colorbar as add_colorbar
from .figures import new_figure as new_figure
from .figures import note_below_axis as note_below_axis
from .figures import save_figure as save_figure
from .html import render_page as render_page
from .html import write_run_report as write_run_report
from .html import write_study_report as write_study_report
