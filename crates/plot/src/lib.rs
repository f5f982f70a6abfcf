//! What a person looks at rather than reads: PNG charts and progress bars.
//!
//! Charts are drawn with plotters' bitmap backend and a bundled font (DejaVu Sans, see
//! assets/DejaVuSans-LICENSE.txt), so no system font or fontconfig is needed, and written
//! atomically (temporary sibling, fsync, rename).

pub mod chart;
pub mod progress;

pub use chart::{grouped_bars_png, line_charts_png, BarGroup, Marker, Panel, Series};
pub use progress::progress_bar;
