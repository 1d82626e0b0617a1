//! The one way drawing fails.

use plotters::drawing::DrawingAreaErrorKind;

/// Drawing failed (plotters reports backend errors as text; nothing here is the user's doing).
#[derive(Debug, thiserror::Error)]
#[error("drawing the plot: {0}")]
pub struct PlotError(String);

impl<E: std::error::Error + Send + Sync> From<DrawingAreaErrorKind<E>> for PlotError {
    fn from(error: DrawingAreaErrorKind<E>) -> Self {
        Self(error.to_string())
    }
}
