//! lab-model
