//! lab-train
