//! `#[derive(Tree)]`: makes a struct a parameter tree whose leaves are its fields' leaves, in
//! declaration order, named by field (`Tree::leaf_names`: `prefix.field`). Every field's type must
//! implement `kiln::Tree` (tensors, trees, numbers).

use proc_macro::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, Fields, parse_macro_input, parse_quote};

/// Derives `kiln::Tree` for a struct.
#[proc_macro_derive(Tree)]
pub fn derive_tree(input: TokenStream) -> TokenStream {
    let mut ast = parse_macro_input!(input as DeriveInput);
    let name = ast.ident.clone();
    let Data::Struct(data) = &ast.data else {
        return syn::Error::new_spanned(&ast.ident, "#[derive(Tree)] supports structs only")
            .to_compile_error()
            .into();
    };
    let members: Vec<syn::Member> = match &data.fields {
        Fields::Named(f) => f
            .named
            .iter()
            .map(|f| syn::Member::Named(f.ident.clone().expect("named")))
            .collect(),
        Fields::Unnamed(f) => (0..f.unnamed.len())
            .map(|i| syn::Member::Unnamed(i.into()))
            .collect(),
        Fields::Unit => Vec::new(),
    };
    // Leaf names: `prefix.field` (tuple structs: `prefix.0`).
    let segments: Vec<String> = members
        .iter()
        .map(|m| match m {
            syn::Member::Named(id) => id.to_string().trim_start_matches("r#").to_string(),
            syn::Member::Unnamed(i) => i.index.to_string(),
        })
        .collect();
    let params: Vec<syn::Ident> = ast
        .generics
        .type_params()
        .map(|p| p.ident.clone())
        .collect();
    let where_clause = ast.generics.make_where_clause();
    for p in params {
        where_clause.predicates.push(parse_quote!(#p: ::kiln::Tree));
    }
    let (impl_g, ty_g, where_g) = ast.generics.split_for_impl();
    let rebuild = match &data.fields {
        Fields::Unit => quote!(#name),
        _ => quote!(#name { #( #members: ::kiln::Tree::map_leaves(&self.#members, f), )* }),
    };
    quote! {
        impl #impl_g ::kiln::Tree for #name #ty_g #where_g {
            fn leaves<'kiln_a>(&'kiln_a self, out: &mut ::std::vec::Vec<&'kiln_a ::kiln::Tensor>) {
                #( ::kiln::Tree::leaves(&self.#members, out); )*
            }
            fn leaf_names(&self, prefix: &str, out: &mut ::std::vec::Vec<::std::string::String>) {
                #( ::kiln::Tree::leaf_names(&self.#members, &::kiln::tree::join_path(prefix, #segments), out); )*
            }
            fn map_leaves(&self, f: &mut dyn FnMut(&::kiln::Tensor) -> ::kiln::Tensor) -> Self {
                #rebuild
            }
        }
    }
    .into()
}
